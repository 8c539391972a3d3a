/* fuzz_chat: chat messages rendered by every built-in template. The input is the "messages"
 * value of a chat request (JSON); byte 0 picks the template and add_generation_prompt. Each
 * message's role and content are taken as the frontend takes them: strings only. */
#include "fuzz.h"
#include "text/chat_template.h"

#include <jansson.h>
#include <stdlib.h>

static const char *const names[] = {"chatml",   "qwen2.5", "qwen3",   "llama3",
                                    "llama3.1", "llama2",  "mistral", "mistral-v1"};
#define N_NAMES  (sizeof(names) / sizeof(names[0]))
#define MAX_MSGS 64

static struct lora_chat_template templates[N_NAMES];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char err[512];

    for (size_t i = 0; i < N_NAMES; i++)
        if (lora_chat_template_by_name(names[i], &templates[i], err, sizeof(err)) < 0)
            abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct lora_chat_message msgs[MAX_MSGS];
    char err[512], *out = NULL;
    size_t n = 0, len;

    if (size < 1)
        return 0;
    unsigned pick = data[0];
    json_t *a = json_loadb((const char *)data + 1, size - 1, JSON_DECODE_ANY, NULL);
    if (!a)
        return 0;
    size_t i;
    json_t *m;
    json_array_foreach (a, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (!role || !content || n == MAX_MSGS)
            break;
        msgs[n].role = role;
        msgs[n].content = content;
        n++;
    }
    if (lora_chat_template_render(&templates[pick % N_NAMES], msgs, n, pick & 0x80, &out, &len, err,
                                  sizeof(err)) == 0)
        free(out);
    json_decref(a);
    return 0;
}
