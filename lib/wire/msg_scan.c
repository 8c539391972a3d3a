/* msg_scan: the one reader of msgpack headers in lora-stack, for bytes nobody trusts yet.
 *
 * It never builds a value: it reads a header (type byte, length field), skips payloads and counts
 * the values a container still owes, so it allocates nothing and reads each byte once. Three
 * users, three entry points:
 *   - lora_msg_scan_body: is a whole body exactly one well-formed value, nested at most
 *     LORA_MSG_SCAN_MAX_DEPTH deep, no container declaring more elements than there are bytes
 *     left? The codec's decoders run it before msgpack_unpack, which allocates a container's
 *     elements from the count in its header (msg.c, pass 1);
 *   - lora_msg_scan_find_key: the raw bytes of one key's value in a top-level map (the type of
 *     a message, a control reply's data) without unpacking;
 *   - lora_msg_scan: where one value ends in a stream that arrives piece by piece (lora-metrics
 *     --stdin, lora-inspect decode), resumable, and refusing as soon as its header is read a
 *     value that would exceed LORA_MSG_MAX_BODY bytes.
 */
#include "wire/msg_codec.h"

#include <string.h>

static uint64_t be_read(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

int lora_msg_scan_header(const unsigned char *p, const unsigned char *end,
                         struct lora_msg_scan_hdr *h)
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
    size_t avail = p < end ? (size_t)(end - p) : 0;
    unsigned b;

    if (avail < 1)
        return 0;
    b = p[0];
    h->hdr = 1;
    h->payload = 0;
    h->children = 0;
    if (b <= 0x7f || b >= 0xe0) /* fixint */
        return 1;
    if (b <= 0x8f) {
        h->children = 2u * (b & 0x0f);
        return 1;
    }
    if (b <= 0x9f) {
        h->children = b & 0x0f;
        return 1;
    }
    if (b <= 0xbf) {
        h->payload = b & 0x1f;
        return 1;
    }
    if (fixed[b - 0xc0]) {
        h->hdr = fixed[b - 0xc0];
        return avail < h->hdr ? 0 : 1;
    }
    int nlen = sized[b - 0xc0];
    if (!nlen)
        return -1;                     /* 0xc1 */
    bool ext = b >= 0xc7 && b <= 0xc9; /* a type byte after the length */
    h->hdr = 1 + (size_t)nlen + ext;
    if (avail < h->hdr)
        return 0;
    uint64_t n = be_read(p + 1, nlen);
    if (b == 0xdc || b == 0xdd)
        h->children = n;
    else if (b == 0xde || b == 0xdf)
        h->children = 2 * n;
    else
        h->payload = n;
    return 1;
}

bool lora_msg_scan_is_map(unsigned char b)
{
    return (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf;
}

bool lora_msg_scan_is_str(unsigned char b)
{
    return (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb);
}

bool lora_msg_scan_is_container(unsigned char b)
{
    return (b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf);
}

int lora_msg_scan_skip(const unsigned char **pp, const unsigned char *end, int depth,
                       const char **why)
{
    const unsigned char *p = *pp;
    struct lora_msg_scan_hdr h;

    if (lora_msg_scan_header(p, end, &h) <= 0) {
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
        if (depth >= LORA_MSG_SCAN_MAX_DEPTH) {
            *why = "nested too deeply";
            return -1;
        }
        for (uint64_t i = 0; i < h.children; i++) {
            if (lora_msg_scan_skip(&p, end, depth + 1, why) < 0) {
                *pp = p;
                return -1;
            }
        }
    }
    *pp = p;
    return 0;
}

int lora_msg_scan_body(const void *body, size_t len, const char **why, size_t *where)
{
    const unsigned char *p = body, *start = body, *end = p + len;

    *where = LORA_MSG_SCAN_WHOLE_BODY;
    if (len > LORA_MSG_MAX_BODY) {
        *why = "larger than LORA_MSG_MAX_BODY";
        return -1;
    }
    if (len == 0 || !body) {
        *why = "empty";
        return -1;
    }
    if (lora_msg_scan_skip(&p, end, 0, why) < 0) {
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

void lora_msg_scan_find_key(const void *body, size_t len, const char *key,
                            const unsigned char **val, size_t *val_len, int *n_found)
{
    const unsigned char *p = body, *end = p + len;
    struct lora_msg_scan_hdr h;
    const char *why;
    size_t klen = strlen(key);

    *val = NULL;
    *val_len = 0;
    *n_found = 0;
    if (lora_msg_scan_header(p, end, &h) <= 0 || !lora_msg_scan_is_map(*p))
        return;
    p += h.hdr;
    for (uint64_t i = 0; i < h.children / 2; i++) {
        const unsigned char *k = p, *v;
        struct lora_msg_scan_hdr kh;
        if (lora_msg_scan_header(k, end, &kh) <= 0 || lora_msg_scan_skip(&p, end, 0, &why) < 0)
            return;
        v = p;
        if (lora_msg_scan_skip(&p, end, 0, &why) < 0)
            return;
        if (lora_msg_scan_is_str(*k) && kh.payload == klen && memcmp(k + kh.hdr, key, klen) == 0) {
            if (++*n_found == 1) {
                *val = v;
                *val_len = (size_t)(p - v);
            }
        }
    }
}

enum lora_msg_scan_result lora_msg_scan(struct lora_msg_scan *st, const void *data, size_t avail,
                                        size_t *len)
{
    const unsigned char *p = data;
    struct lora_msg_scan_hdr h;

    if (!st->started) {
        st->started = true;
        st->pos = 0;
        st->pending = 1;
    }
    while (st->pending > 0) {
        if (st->pos >= avail)
            return LORA_MSG_SCAN_MORE;
        int rc = lora_msg_scan_header(p + st->pos, p + avail, &h);
        if (rc < 0) {
            *len = st->pos;
            return LORA_MSG_SCAN_MALFORMED;
        }
        if (rc == 0)
            return LORA_MSG_SCAN_MORE; /* the header is cut short */
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
