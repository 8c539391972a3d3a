/* buf: see buf.h. */
#include "base/buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BUF_INITIAL_SIZE 256

int lora_buf_reserve(struct lora_buf *b, size_t extra)
{
    if (extra > SIZE_MAX / 2 - b->len) {
        b->failed = true;
        return -1;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : BUF_INITIAL_SIZE;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return -1;
    }
    b->data = p;
    b->cap = cap;
    return 0;
}

int lora_buf_add(struct lora_buf *b, const void *p, size_t n)
{
    if (lora_buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int lora_buf_add_str(struct lora_buf *b, const char *s)
{
    return lora_buf_add(b, s, strlen(s));
}

int lora_buf_add_char(struct lora_buf *b, char c)
{
    return lora_buf_add(b, &c, 1);
}

int lora_buf_write(void *buf, const char *p, size_t n)
{
    return lora_buf_add(buf, p, n);
}

void lora_buf_reset(struct lora_buf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data)
        b->data[0] = '\0';
}

void lora_buf_release(struct lora_buf *b)
{
    free(b->data);
    *b = (struct lora_buf){0};
}
