/* lora-inspect: where one msgpack value ends, in a stream that arrives piece by piece.
 *
 * decode needs the boundaries of concatenated maps before it can hand each one to
 * lora_msg_to_json. msgpack-c's msgpack_unpacker would find them too, but it builds objects as
 * it goes and allocates a container's element array from the count in its header, before the
 * elements arrive: five bytes (0xdd ff ff ff ff) would ask for about 100 GiB. This scanner
 * only counts: it walks headers, skips payloads, keeps the number of values still owed, and
 * allocates nothing. A value that would end past LORA_MSG_MAX_BODY bytes, or that declares more
 * elements than that many bytes could hold, is refused as soon as its header is read, so the
 * caller never buffers more than LORA_MSG_MAX_BODY bytes of one message. */
#include "inspect.h"

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* The header of the value at p: its length *head (1 to 6 bytes), the length of its payload
 * *body, and the values it contains *children. Returns -1 for the reserved byte 0xc1, 0 when
 * avail bytes are too few to read the header, 1 when it was read. */
static int header(const unsigned char *p, size_t avail, size_t *head, uint64_t *body,
                  uint64_t *children)
{
    unsigned char b = p[0];
    int n = 0; /* bytes of a length field after the type byte */

    *head = 1;
    *body = 0;
    *children = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return 1;
    if (b == 0xc1)
        return -1;
    if (b >= 0x80 && b <= 0x8f) {
        *children = 2u * (b & 0x0f);
        return 1;
    }
    if (b >= 0x90 && b <= 0x9f) {
        *children = b & 0x0f;
        return 1;
    }
    if (b >= 0xa0 && b <= 0xbf) {
        *body = b & 0x1f;
        return 1;
    }
    switch (b) {
    case 0xca: /* float 32 */
    case 0xce: /* uint 32 */
    case 0xd2: /* int 32 */
        *body = 4;
        return 1;
    case 0xcb:
    case 0xcf:
    case 0xd3:
        *body = 8;
        return 1;
    case 0xcc:
    case 0xd0:
        *body = 1;
        return 1;
    case 0xcd:
    case 0xd1:
        *body = 2;
        return 1;
    case 0xd4: /* fixext 1, 2, 4, 8, 16: a type byte and the data */
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        *body = 1 + (1u << (b - 0xd4));
        return 1;
    }
    /* The rest have a length field of n bytes. */
    switch (b) {
    case 0xc4: /* bin 8, 16, 32 */
    case 0xd9: /* str 8 */
    case 0xc7: /* ext 8 */
        n = 1;
        break;
    case 0xc5:
    case 0xda:
    case 0xc8:
    case 0xdc: /* array 16 */
    case 0xde: /* map 16 */
        n = 2;
        break;
    default: /* 0xc6, 0xdb, 0xc9, 0xdd, 0xdf */
        n = 4;
        break;
    }
    if (avail < (size_t)(1 + n))
        return 0;
    uint64_t len = be(p + 1, n);
    *head = (size_t)(1 + n);
    if (b == 0xdc || b == 0xdd)
        *children = len;
    else if (b == 0xde || b == 0xdf)
        *children = 2 * len;
    else if (b == 0xc7 || b == 0xc8 || b == 0xc9)
        *body = len + 1; /* the type byte, then the data */
    else
        *body = len;
    return 1;
}

enum scan_result scan_value(struct scan_state *st, const unsigned char *data, size_t avail,
                            size_t *len)
{
    if (!st->started) {
        if (avail == 0)
            return SCAN_MORE;
        unsigned char b = data[0];
        if (!((b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf)) {
            *len = 0;
            return SCAN_MALFORMED;
        }
        st->started = true;
        st->pos = 0;
        st->pending = 1;
    }
    while (st->pending > 0) {
        size_t head;
        uint64_t body, children;
        if (st->pos >= avail)
            return SCAN_MORE;
        int h = header(data + st->pos, avail - st->pos, &head, &body, &children);
        if (h < 0) {
            *len = st->pos;
            return SCAN_MALFORMED;
        }
        if (h == 0)
            return SCAN_MORE;
        /* Every value takes at least one byte: owing more than the bytes left is too large. */
        uint64_t room = LORA_MSG_MAX_BODY - st->pos;
        if (head > room || body > room - head ||
            children + (st->pending - 1) > room - head - body) {
            *len = st->pos;
            return SCAN_TOO_LARGE;
        }
        if (head + body > avail - st->pos)
            return SCAN_MORE;
        st->pos += head + (size_t)body;
        st->pending += children - 1;
    }
    *len = st->pos;
    return SCAN_DONE;
}
