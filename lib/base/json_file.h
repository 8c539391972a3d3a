/* json_file: reads a JSON document from a file with errors a person can act on.
 *
 * Errors are "PATH: unable to open: REASON" (errno is kept, so a caller can tell a missing file
 * from a broken one), "PATH: not a regular file", "PATH: larger than N bytes" or "PATH: invalid
 * JSON at line L column C (byte B): WHAT", where WHAT says what was wrong without quoting the
 * file (a file read by mistake, a secret behind a link, never shows up in a log). Duplicate keys are rejected, since a file that says two things
 * about one key is ambiguous. The file is opened without blocking and must be a regular file,
 * so a FIFO or a device in its place is an error, never a hang.
 */
#ifndef LORA_JSON_FILE_H
#define LORA_JSON_FILE_H

#include <jansson.h>
#include <stddef.h>

#define LORA_JSON_FILE_MAX_BYTES (256u << 20) /* the bound of lora_json_file_load() */

/* Returns a new reference to the document's top-level object, or NULL with err set (and errno
 * set to ENOENT when the file does not exist). Files over max_bytes are refused (EFBIG). */
json_t *lora_json_file_load_bounded(const char *path, size_t max_bytes, char *err,
                                    size_t err_len);
/* The same from a descriptor open for reading, which it closes; label names the file in
 * errors. The caller opened it (without blocking); this checks it is a regular file. */
json_t *lora_json_file_load_fd(int fd, const char *label, size_t max_bytes, char *err,
                               size_t err_len);

/* What a jansson error code means, without the text near it (which quotes the input). */
const char *lora_json_error_what(const json_error_t *jerr);

/* The same, up to LORA_JSON_FILE_MAX_BYTES. */
json_t *lora_json_file_load(const char *path, char *err, size_t err_len);

#endif
