/* fuzz_tokenize: text to tokenize (any bytes, as a prompt is) with a byte-level BPE tokenizer
 * like a Llama's (the generated model's), and the ids back to text, whole and streamed. */
#include "fuzz.h"
#include "runtime/synthetic.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>

static struct lora_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct lora_synthetic_model_opts o;
    char err[512], path[512];

    lora_synthetic_model_defaults(&o);
    snprintf(path, sizeof(path), "%s/model", fuzz_dir());
    if (lora_synthetic_model_write(path, &o, err, sizeof(err)) < 0) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err);
        abort();
    }
    snprintf(path, sizeof(path), "%s/model/tokenizer.json", fuzz_dir());
    if (!(tok = lora_tokenizer_load(path, err, sizeof(err)))) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids = NULL;
    size_t n = 0, len;
    char err[512], *out = NULL, *piece;
    bool special = size && (data[0] & 1);

    if (lora_tokenizer_encode(tok, (const char *)data, size, special, &ids, &n, err, sizeof(err)) <
        0)
        return 0;
    if (lora_tokenizer_decode(tok, ids, n, !special, &out, &len, err, sizeof(err)) == 0)
        free(out);
    struct lora_detok *d = lora_detok_new(tok, !special);
    if (!d)
        abort();
    for (size_t i = 0; i < n; i++) {
        if (lora_detok_push(d, ids + i, 1, &piece, &len, err, sizeof(err)) == 0)
            free(piece);
    }
    if (lora_detok_finish(d, &piece, &len, err, sizeof(err)) == 0)
        free(piece);
    lora_detok_destroy(&d);
    free(ids);
    return 0;
}
