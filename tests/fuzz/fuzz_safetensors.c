/* fuzz_safetensors: a .safetensors file (its header length, JSON header and offsets) opened,
 * every tensor found by name, inside the mapping, and converted to float32 where it is small. */
#include "fuzz.h"
#include "runtime/safetensors.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[512];
    const char *path = fuzz_write("model.safetensors", data, size);
    struct lora_safetensors *st = lora_safetensors_open(path, err, sizeof(err));

    if (!st)
        return 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct lora_tensor_info *t = &st->tensors[i];
        if (lora_safetensors_find(st, t->name) == NULL)
            abort();
        char shape[256];
        lora_tensor_shape_str(t, shape, sizeof(shape));
        /* the data lies inside the mapping */
        const char *b = st->map, *d = t->data;
        if (t->bytes &&
            (d < b || t->bytes > st->map_bytes || d - b > (long)(st->map_bytes - t->bytes)))
            abort();
        if (t->dtype <= LORA_DTYPE_BF16 && t->numel <= 256) {
            float f[256];
            lora_dtype_to_f32(t->dtype, t->data, f, (size_t)t->numel);
        }
    }
    lora_safetensors_close(&st);
    return 0;
}
