/* fuzz_msg_decode: every typed msgpack message decoder and lora_msg_peek_type.
 *
 * Input: byte 0 picks the decoder, byte 1 the number of binary frames (0 to 2) and byte 2 their
 * length; the frames are taken from the end and the body is what is left in between. */
#include "fuzz.h"
#include "wire/msg.h"

#include <stdlib.h>

typedef int (*decoder)(const void *, size_t, const struct lora_msg_bin *, int,
                       struct lora_msg_arena *, void *, char *, size_t);

#define D(name) (decoder) lora_msg_decode_##name
static const decoder decoders[] = {
    D(hello),         D(ready),           D(setup),         D(setup_done),
    D(step),          D(step_reply),      D(adapter_op),    D(adapter_op_reply),
    D(notifications), D(residency_reply), D(request),       D(abort),
    D(output),        D(event),           D(stats),         D(control),
    D(control_reply), D(registry),        D(request_stats),
};
#undef D

static struct lora_msg_arena *arena;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    union lora_msg_any m;
    struct lora_msg_bin bins[2];
    char err[512];

    if (size < 3)
        return 0;
    if (!arena && !(arena = lora_msg_arena_new()))
        abort();
    size_t which = data[0] % (sizeof(decoders) / sizeof(decoders[0]));
    int n_bins = data[1] % 3;
    size_t bin_len = data[2];
    data += 3;
    size -= 3;
    for (int i = 0; i < n_bins; i++) {
        size_t n = bin_len < size ? bin_len : size;
        bins[i].data = data + size - n;
        bins[i].len = n;
        size -= n;
    }
    lora_msg_arena_reset(arena);
    decoders[which](data, size, bins, n_bins, arena, &m, err, sizeof(err));
    lora_msg_peek_type(data, size, err, sizeof(err));
    return 0;
}
