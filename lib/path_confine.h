/* path_confine: keeps a client-given path inside a directory (runtime adapter loading under
 * --lora-root, DESIGN section 12).
 *
 * A path is accepted only when (1) it has no ".." component, (2) an absolute path starts with
 * the root, (3) with every symbolic link resolved it still lies strictly under the root, and
 * (4) it names a directory. A relative path is taken under the root. The answer is the
 * resolved path, which the caller uses from then on, so a link swapped after the check can at
 * worst point at another directory under the root that was resolved before. Stateless and
 * thread-safe.
 */
#ifndef LORA_PATH_CONFINE_H
#define LORA_PATH_CONFINE_H

#include <stddef.h>

enum lora_confine_error {
    LORA_CONFINE_OK,
    LORA_CONFINE_ESCAPE,  /* "..", outside the root, or a link that leads out */
    LORA_CONFINE_MISSING, /* nothing there */
    LORA_CONFINE_NOT_DIR, /* there, but not a directory */
};

/* root must be a real path (no links, no trailing slash). Returns the resolved path (the
 * caller frees it), or NULL with *why and a message naming the path in err. */
char *lora_path_confine(const char *root, const char *path, enum lora_confine_error *why,
                        char *err, size_t err_len);

#endif
