/* json_file: reads a JSON document from a file with errors a person can act on.
 *
 * Errors are "PATH: unable to open: REASON" (errno is kept, so a caller can tell a missing file
 * from a broken one), "PATH: not a regular file", "PATH: larger than N bytes" or "PATH: invalid
 * JSON at line L column C: WHAT". Duplicate keys are rejected, since a file that says two things
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
/* The same, up to LORA_JSON_FILE_MAX_BYTES. */
json_t *lora_json_file_load(const char *path, char *err, size_t err_len);

#endif
