/* path_confine: keeps a client-given path inside a directory (runtime adapter loading under
 * --lora-root), both when the path is checked and when its files are opened.
 *
 * lora_path_confine is the check a frontend makes on a client's path string: accepted only when
 * (1) it has no ".." component, (2) an absolute path starts with the root, (3) with every
 * symbolic link resolved it still lies strictly under the root, (4) it names a directory and
 * (5) no component below the root is a symbolic link, unless allow_symlinks. A relative path is
 * taken under the root. The answer is the resolved path.
 *
 * A check alone cannot hold: the directory can be swapped for a link between the check and the
 * open. lora_path_confine_open is the guard at open time, for the process that reads the files: it
 * resolves a relative path beneath a directory descriptor opened once (the root), with
 * openat2(RESOLVE_BENEATH) where the kernel has it, else one openat(O_NOFOLLOW) per component
 * from the root down, each relative to the directory opened before. Nothing it opens can lie
 * outside the root, whatever is swapped meanwhile. Stateless and thread-safe.
 */
#ifndef LORA_PATH_CONFINE_H
#define LORA_PATH_CONFINE_H

#include <stdbool.h>
#include <stddef.h>

enum lora_path_confine_error {
    LORA_CONFINE_OK,
    LORA_CONFINE_ESCAPE,  /* "..", outside the root, or a link that leads out */
    LORA_CONFINE_MISSING, /* nothing there */
    LORA_CONFINE_NOT_DIR, /* there, but not a directory */
    LORA_CONFINE_SYMLINK, /* a symbolic link below the root, and links are not allowed */
};

/* root must be a real path (no links, no trailing slash). Returns the resolved path (the
 * caller frees it), or NULL with *why and a message naming the path in err. */
char *lora_path_confine(const char *root, const char *path, bool allow_symlinks,
                        enum lora_path_confine_error *why, char *err, size_t err_len);

/* Opens rel (relative, without "..") beneath the directory root_fd. flags: O_DIRECTORY to open a
 * directory, 0 to open a file to read (opened with O_NONBLOCK, so a FIFO never blocks; the
 * caller checks the kind with fstat). A symbolic link anywhere in rel is refused, unless
 * allow_symlinks and it resolves beneath root_fd. Returns the descriptor (the caller's), or -1
 * with *why, errno and "LABEL/rel: reason" in err (label names the root for people). */
int lora_path_confine_open(int root_fd, const char *label, const char *rel, int flags,
                      bool allow_symlinks, enum lora_path_confine_error *why, char *err, size_t err_len);

/* The same without openat2: the component walk lora_path_confine_open falls back to where the kernel
 * lacks it (ENOSYS). It never follows a link, so allow_symlinks cannot be honoured: a link is
 * then refused with a message saying so. For the tests. */
int lora_path_confine_open_walk(int root_fd, const char *label, const char *rel, int flags,
                           bool allow_symlinks, enum lora_path_confine_error *why, char *err,
                           size_t err_len);

/* If path lies strictly under root (a string test), returns the part after "root/"; else NULL. */
const char *lora_path_confine_relative(const char *root, const char *path);

#endif
