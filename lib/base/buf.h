/* buf: the one growable byte buffer of the toolkit (docs/design.md, "Base"): encoders' output,
 * prompts being rendered, generated text, tokenizer scratch.
 *
 * Growth is a try-allocation, doubling: on failure (no memory, or a size past SIZE_MAX / 2) the
 * call returns -1, the buffer keeps what it held and `failed` stays set, so a caller appending
 * many pieces may check once at the end. After a successful append the data is NUL-terminated
 * (the NUL is not counted in len), so text can be used as a C string. A zeroed struct is an empty
 * buffer; lora_buf_release frees it.
 */
#ifndef LORA_BUF_H
#define LORA_BUF_H

#include <stdbool.h>
#include <stddef.h>

struct lora_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed; /* an append did not fit: the content is incomplete */
};

/* Room for extra more bytes and the NUL. 0 or -1. */
int lora_buf_reserve(struct lora_buf *b, size_t extra);
int lora_buf_add(struct lora_buf *b, const void *p, size_t n);
int lora_buf_add_str(struct lora_buf *b, const char *s);
int lora_buf_add_char(struct lora_buf *b, char c);

/* msgpack-c's write callback (msgpack_packer_init(pk, buf, lora_buf_write)). */
int lora_buf_write(void *buf, const char *p, size_t n);

void lora_buf_reset(struct lora_buf *b);   /* empty again, keeps the memory and clears failed */
void lora_buf_release(struct lora_buf *b); /* frees the memory */

#endif
