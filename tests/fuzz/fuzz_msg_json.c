/* fuzz_msg_json: lora_msg_to_json on any bytes (lora-inspect decode, events, logs). The JSON it
 * writes must parse. */
#include "fuzz.h"
#include "wire/msg.h"

#include <jansson.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct lora_buf out = {0};
    char err[512];

    if (lora_msg_to_json(data, size, &out, err, sizeof(err)) == 0) {
        json_t *j = json_loadb(out.data, out.len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!j)
            abort();
        json_decref(j);
    }
    lora_buf_release(&out);
    return 0;
}
