/* msg_json: any msgpack body as JSON text, for lora-inspect decode and for logs (see
 * msg.h, lora_msg_to_json).
 *
 * A recursive descent over the raw bytes that builds jansson values as it goes: every read is
 * bounds-checked, a container may not declare more elements than there are bytes left,
 * nesting is limited (JSON_MAX_DEPTH) and so are container keys (JSON_MAX_KEY_DEPTH), so a
 * hostile body costs time, memory and output proportional to its length.
 * Mapping: maps -> objects (a non-string key becomes the JSON text of the key), arrays ->
 * arrays, str -> string (invalid UTF-8 bytes become U+FFFD, and so does a NUL in a key), bin ->
 * base64 string, ext -> null, non-finite floats -> null, unsigned integers above INT64_MAX -> a
 * (rounded) real. The text always reads back with jansson.
 */
#include "wire/msg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define JSON_MAX_DEPTH 32 /* levels of nesting; the error message says the number */

/* A non-string key is written as its JSON text, and that text is escaped again as the key of
 * the enclosing object: a container key inside a container key would be escaped twice, and
 * each further level doubles its backslashes, so output would grow exponentially with nesting.
 * One level of container keys is kept (the text is escaped at most twice, so the output stays
 * within a constant factor of the input); a container key inside one is refused. */
#define JSON_MAX_KEY_DEPTH 1

struct reader {
    const unsigned char *p, *start, *end;
    const char *why; /* set on the first error */
    int key_depth;   /* container keys that enclose the value being read */
};

static bool take(struct reader *r, size_t n, const unsigned char **out)
{
    if (n > (size_t)(r->end - r->p)) {
        r->why = "truncated";
        return false;
    }
    *out = r->p;
    r->p += n;
    return true;
}

/* A big-endian unsigned integer of n bytes. */
static bool take_be(struct reader *r, int n, uint64_t *v)
{
    const unsigned char *q;

    if (!take(r, (size_t)n, &q))
        return false;
    *v = 0;
    for (int i = 0; i < n; i++)
        *v = *v << 8 | q[i];
    return true;
}

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static json_t *base64_string(const unsigned char *s, size_t n)
{
    size_t out_len = (n + 2) / 3 * 4;
    char *o = malloc(out_len + 1);
    size_t j = 0;

    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        o[j++] = b64_alphabet[v >> 18 & 63];
        o[j++] = b64_alphabet[v >> 12 & 63];
        o[j++] = i + 1 < n ? b64_alphabet[v >> 6 & 63] : '=';
        o[j++] = i + 2 < n ? b64_alphabet[v & 63] : '=';
    }
    json_t *str = json_stringn_nocheck(o, j);
    free(o);
    return str;
}

/* Length of the well-formed UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp, min;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
        min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
        len = 3;
        cp = c & 0x0f;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string of s[0..n), each byte that is not part of valid UTF-8 replaced by U+FFFD. */
static json_t *text_string(const unsigned char *s, size_t n)
{
    size_t i = 0, j = 0, k;

    while (i < n && (k = utf8_len(s + i, n - i)))
        i += k;
    if (i == n)
        return json_stringn_nocheck((const char *)s, n);
    if (n > SIZE_MAX / 3)
        return NULL;
    char *o = malloc(3 * n);
    if (!o)
        return NULL;
    for (i = 0; i < n;) {
        k = utf8_len(s + i, n - i);
        if (k) {
            memcpy(o + j, s + i, k);
            i += k;
            j += k;
        } else {
            memcpy(o + j, "\xef\xbf\xbd", 3);
            i++;
            j += 3;
        }
    }
    json_t *str = json_stringn_nocheck(o, j);
    free(o);
    return str;
}

static json_t *real_or_null(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

static json_t *read_value(struct reader *r, int depth);

static json_t *read_array(struct reader *r, uint64_t n, int depth)
{
    if (n > (uint64_t)(r->end - r->p)) {
        r->why = "truncated";
        return NULL;
    }
    json_t *a = json_array();
    for (uint64_t i = 0; a && i < n; i++) {
        json_t *v = read_value(r, depth + 1);
        if (!v || json_array_append_new(a, v) < 0) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

/* A map key: any value, but a container only where no container key encloses it. */
static json_t *read_key(struct reader *r, int depth)
{
    const unsigned char b = r->p < r->end ? *r->p : 0;
    bool container = (b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf);

    if (!container)
        return read_value(r, depth);
    if (r->key_depth >= JSON_MAX_KEY_DEPTH) {
        r->why = "a map or array as a map key inside a map or array key";
        return NULL;
    }
    r->key_depth++;
    json_t *k = read_value(r, depth);
    r->key_depth--;
    return k;
}

/* Sets o[k] = v for a string key k. A NUL byte in a key becomes U+FFFD: jansson writes it as
 * \u0000 but refuses it when reading an object key, as many JSON readers do, and the text must
 * read back. */
static int set_string_key(json_t *o, json_t *k, json_t *v)
{
    const char *s = json_string_value(k);
    size_t n = json_string_length(k), j = 0;

    if (!memchr(s, 0, n))
        return json_object_setn_nocheck(o, s, n, v);
    if (n > SIZE_MAX / 3)
        return -1;
    char *t = malloc(3 * n);
    if (!t)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i]) {
            t[j++] = s[i];
        } else {
            memcpy(t + j, "\xef\xbf\xbd", 3);
            j += 3;
        }
    }
    int rc = json_object_setn_nocheck(o, t, j, v);
    free(t);
    return rc;
}

/* The object key for k: a string as it is, anything else as its JSON text. */
static json_t *read_map(struct reader *r, uint64_t n, int depth)
{
    if (n > (uint64_t)(r->end - r->p) / 2) {
        r->why = "truncated";
        return NULL;
    }
    json_t *o = json_object();
    for (uint64_t i = 0; o && i < n; i++) {
        json_t *k = read_key(r, depth + 1), *v = k ? read_value(r, depth + 1) : NULL;
        char *text = NULL;
        int rc = -1;
        if (v && json_is_string(k))
            rc = set_string_key(o, k, v);
        else if (v && (text = json_dumps(k, JSON_COMPACT | JSON_ENCODE_ANY)))
            rc = json_object_set_nocheck(o, text, v);
        free(text);
        json_decref(k);
        json_decref(v);
        if (rc < 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *read_str(struct reader *r, int len_bytes, bool bin)
{
    uint64_t n;
    const unsigned char *s;

    if (!take_be(r, len_bytes, &n) || n > (uint64_t)(r->end - r->p) || !take(r, (size_t)n, &s))
        return NULL;
    return bin ? base64_string(s, (size_t)n) : text_string(s, (size_t)n);
}

/* ext: the type byte and the data are skipped. */
static json_t *skip_ext(struct reader *r, int len_bytes, uint64_t fixed)
{
    uint64_t n = fixed;
    const unsigned char *s;

    if (len_bytes && !take_be(r, len_bytes, &n))
        return NULL;
    if (n >= (uint64_t)(r->end - r->p) || !take(r, (size_t)n + 1, &s)) {
        r->why = "truncated";
        return NULL;
    }
    return json_null();
}

static json_t *read_number(struct reader *r, unsigned b)
{
    uint64_t v;

    if (b == 0xca || b == 0xcb) {
        if (!take_be(r, b == 0xca ? 4 : 8, &v))
            return NULL;
        if (b == 0xca) {
            uint32_t w = (uint32_t)v;
            float f;
            memcpy(&f, &w, sizeof(f));
            return real_or_null(f);
        }
        double x;
        memcpy(&x, &v, sizeof(x));
        return real_or_null(x);
    }
    int n = 1 << ((b - 0xcc) & 3); /* uint8..64 (0xcc..0xcf), int8..64 (0xd0..0xd3) */
    if (!take_be(r, n, &v))
        return NULL;
    if (b <= 0xcf)
        return v > INT64_MAX ? json_real((double)v) : json_integer((json_int_t)v);
    int64_t s;
    switch (n) {
    case 1:
        s = (int8_t)(uint8_t)v;
        break;
    case 2:
        s = (int16_t)(uint16_t)v;
        break;
    case 4:
        s = (int32_t)(uint32_t)v;
        break;
    default:
        s = (int64_t)v;
        break;
    }
    return json_integer(s);
}

static json_t *read_value(struct reader *r, int depth)
{
    const unsigned char *q;
    uint64_t n;

    if (depth > JSON_MAX_DEPTH) {
        r->why = "nested too deeply (more than 32 levels)";
        return NULL;
    }
    if (!take(r, 1, &q))
        return NULL;
    unsigned b = *q;
    if (b <= 0x7f)
        return json_integer(b);
    if (b >= 0xe0)
        return json_integer((int8_t)(uint8_t)b);
    if (b <= 0x8f)
        return read_map(r, b & 0x0f, depth);
    if (b <= 0x9f)
        return read_array(r, b & 0x0f, depth);
    if (b <= 0xbf) {
        if (!take(r, b & 0x1f, &q))
            return NULL;
        return text_string(q, b & 0x1f);
    }
    switch (b) {
    case 0xc0:
        return json_null();
    case 0xc2:
        return json_false();
    case 0xc3:
        return json_true();
    case 0xc4:
        return read_str(r, 1, true);
    case 0xc5:
        return read_str(r, 2, true);
    case 0xc6:
        return read_str(r, 4, true);
    case 0xc7:
        return skip_ext(r, 1, 0);
    case 0xc8:
        return skip_ext(r, 2, 0);
    case 0xc9:
        return skip_ext(r, 4, 0);
    case 0xd4:
        return skip_ext(r, 0, 1);
    case 0xd5:
        return skip_ext(r, 0, 2);
    case 0xd6:
        return skip_ext(r, 0, 4);
    case 0xd7:
        return skip_ext(r, 0, 8);
    case 0xd8:
        return skip_ext(r, 0, 16);
    case 0xd9:
        return read_str(r, 1, false);
    case 0xda:
        return read_str(r, 2, false);
    case 0xdb:
        return read_str(r, 4, false);
    case 0xdc:
        return take_be(r, 2, &n) ? read_array(r, n, depth) : NULL;
    case 0xdd:
        return take_be(r, 4, &n) ? read_array(r, n, depth) : NULL;
    case 0xde:
        return take_be(r, 2, &n) ? read_map(r, n, depth) : NULL;
    case 0xdf:
        return take_be(r, 4, &n) ? read_map(r, n, depth) : NULL;
    case 0xc1:
        r->why = "reserved byte 0xc1";
        return NULL;
    default:
        return read_number(r, b); /* 0xca..0xd3 */
    }
}

int lora_msg_to_json(const void *body, size_t len, struct lora_buf *out, char *err,
                     size_t err_len)
{
    struct reader r = {.p = body, .start = body, .end = (const unsigned char *)body + len};
    json_t *root;
    char *text;

    if (!err)
        err_len = 0;
    if (len > LORA_MSG_MAX_BODY) {
        snprintf(err, err_len, "message: body: larger than LORA_MSG_MAX_BODY (%zu bytes)", len);
        return -1;
    }
    if (!body || len == 0) {
        snprintf(err, err_len, "message: body: empty (0 bytes)");
        return -1;
    }
    root = read_value(&r, 0);
    if (root && r.p != r.end) {
        r.why = "trailing bytes after the value";
        json_decref(root);
        root = NULL;
    }
    if (!root) {
        if (r.why)
            snprintf(err, err_len, "message: body: %s (byte %zu of %zu)", r.why,
                     (size_t)(r.p - r.start), len);
        else
            snprintf(err, err_len, "message: body: out of memory");
        return -1;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(root);
    if (!text || lora_buf_add(out, text, strlen(text)) < 0) {
        free(text);
        snprintf(err, err_len, "message: out of memory");
        errno = ENOMEM;
        return -1;
    }
    free(text);
    return 0;
}
