/* fs: directory helpers shared by the generators, the demo model and the tests.
 *
 * Neither function keeps state. lora_fs_mkdir_p is mkdir -p: directories are created with mode
 * 0777 less the umask (0755 under the usual umask 022), as mkdir(1) does; its errors are
 * "PATH: unable to create directory: REASON", where PATH is the first directory of the path
 * that could not be created, or "PATH: out of memory". lora_fs_remove_tree is rm -r without
 * following symbolic links, and reports nothing. lora_fs_open_regular opens a file to read
 * without ever blocking in open(2) and hands it back only when it is a regular file, so a FIFO,
 * a socket or a device in a file's place is an error at once, never a hang.
 */
#ifndef LORA_FS_H
#define LORA_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* Creates path and its missing parents; an existing directory is fine. Returns 0, or -1 with
 * err set (err may be NULL). */
int lora_fs_mkdir_p(const char *path, char *err, size_t err_len);

/* Removes path and everything under it, best effort: it stops at the first entry it cannot
 * remove, and a missing path is fine. */
void lora_fs_remove_tree(const char *path);

/* Opens path (relative to dir_fd, or AT_FDCWD) read-only with O_NONBLOCK, adding O_NOFOLLOW
 * unless follow, and checks with fstat that it is a regular file (st gets the result; may be
 * NULL). Returns the descriptor (the caller's), or -1 with "LABEL: reason" in err (label names
 * the file for people; path when NULL). */
int lora_fs_open_regular(int dir_fd, const char *path, const char *label, bool follow,
                         struct stat *st, char *err, size_t err_len);

/* Checks that fd, already open, is a regular file; else writes "LABEL: not a regular file (a
 * FIFO)" and the like into err and returns -1 (fd stays open). */
int lora_fs_check_regular(int fd, const char *label, struct stat *st, char *err, size_t err_len);

/* What kind of file mode is, for messages: "a FIFO", "a socket", "a directory", ... */
const char *lora_fs_kind(mode_t mode);

#endif
