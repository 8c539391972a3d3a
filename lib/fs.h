/* fs: directory helpers shared by the generators, the demo model and the tests.
 *
 * Neither function keeps state. lora_fs_mkdir_p is mkdir -p: directories are created with mode
 * 0777 less the umask (0755 under the usual umask 022), as mkdir(1) does; its errors are
 * "PATH: unable to create directory: REASON", where PATH is the first directory of the path
 * that could not be created, or "PATH: out of memory". lora_fs_remove_tree is rm -r without
 * following symbolic links, and reports nothing.
 */
#ifndef LORA_FS_H
#define LORA_FS_H

#include <stddef.h>

/* Creates path and its missing parents; an existing directory is fine. Returns 0, or -1 with
 * err set (err may be NULL). */
int lora_fs_mkdir_p(const char *path, char *err, size_t err_len);

/* Removes path and everything under it, best effort: it stops at the first entry it cannot
 * remove, and a missing path is fine. */
void lora_fs_remove_tree(const char *path);

#endif
