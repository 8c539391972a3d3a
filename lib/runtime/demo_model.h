/* demo_model: the embedded default model, so that the stack runs on a machine with no weights.
 *
 * A small generated Llama (synthetic.h) with a byte-level tokenizer and three adapters under
 * DIR/adapters/ (demo-sql rank 8, demo-chat rank 16, demo-code rank 8 on q,v only). It is written
 * once into a cache directory and reused: $LORA_DEMO_DIR, else $XDG_CACHE_HOME/lora-stack/demo-v2,
 * else $HOME/.cache/lora-stack/demo-v2. Written under a temporary name and renamed, so concurrent
 * first runs do not see half a model.
 */
#ifndef LORA_DEMO_MODEL_H
#define LORA_DEMO_MODEL_H

#include <stddef.h>

/* Ensures the demo model exists and writes its directory into dir. Returns 0 or -1 with err. */
int lora_demo_model_ensure(char *dir, size_t dir_len, char *err, size_t err_len);

#endif
