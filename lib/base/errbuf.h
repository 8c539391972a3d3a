/* errbuf: writing a message into a caller's error buffer.
 *
 * Library functions report detail through an (err, err_len) pair the caller owns; these helpers
 * format into it so every module fills it the same way.
 *
 * Invariants a caller can rely on:
 * - err may be NULL and err_len may be 0: then nothing is written.
 * - Otherwise err is always NUL-terminated, holding the message truncated to err_len - 1 bytes.
 * - Neither helper allocates or logs.
 */
#ifndef LORA_ERRBUF_H
#define LORA_ERRBUF_H

#include <stddef.h>

/* Formats fmt into err (err_len bytes). */
void lora_errf(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Formats "PATH: message" into err (err_len bytes); a NULL path is written as "(null)". When the
 * prefix alone fills err, it is kept truncated and the message is dropped. */
void lora_errf_path(char *err, size_t err_len, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
