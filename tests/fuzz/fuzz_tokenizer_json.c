/* fuzz_tokenizer_json: a tokenizer.json loaded and, when it loads, used: a fixed text encoded
 * (with and without special tokens) and decoded back, and every id's string looked up. */
#include "fuzz.h"
#include "text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char text[] = "Hello, world! 123 \xc3\xa9t\xc3\xa9 <s> \n\t  x";
    char err[512];
    const char *path = fuzz_write("tokenizer.json", data, size);
    struct lora_tokenizer *t = lora_tokenizer_load(path, err, sizeof(err));
    int32_t *ids = NULL;
    size_t n = 0, len;
    char *out = NULL;

    if (!t)
        return 0;
    for (int special = 0; special < 2; special++) {
        if (lora_tokenizer_encode(t, text, sizeof(text) - 1, special, &ids, &n, err, sizeof(err)) ==
            0) {
            if (lora_tokenizer_decode(t, ids, n, !special, &out, &len, err, sizeof(err)) == 0)
                free(out);
            free(ids);
        }
    }
    size_t v = lora_tokenizer_vocab_size(t);
    for (size_t i = 0; i < v && i < 4096; i++) {
        const char *s = lora_tokenizer_token_str(t, (int32_t)i);
        if (s)
            lora_tokenizer_token_id(t, s);
    }
    lora_tokenizer_destroy(&t);
    return 0;
}
