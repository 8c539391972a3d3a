/* json_file: reads a JSON document from a file with errors a person can act on.
 *
 * Errors are "PATH: unable to open: REASON" (errno is kept, so a caller can tell a missing file
 * from a broken one) or "PATH: invalid JSON at line L column C: WHAT". Duplicate keys are
 * rejected, since a file that says two things about one key is ambiguous.
 */
#ifndef LORA_JSON_FILE_H
#define LORA_JSON_FILE_H

#include <jansson.h>
#include <stddef.h>

/* Returns a new reference to the document's top-level object, or NULL with err set (and errno
 * set to ENOENT when the file does not exist). */
json_t *lora_json_file_load(const char *path, char *err, size_t err_len);

#endif
